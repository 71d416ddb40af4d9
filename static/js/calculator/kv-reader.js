// How the config reader reads one value, no DOM: the twin of formulas/kv_reader.py (the alias table's facts, the
// bounds, and the one way both twins show a value in a message, so an error reads the same in either). The file's
// keys are read as own properties only, so names like "constructor" or "__proto__" are plain unknown keys.

export const BIG = 2 ** 30;
const SHOWN_CHARS = 40; // a string in a message is cut here: a 2 MB value must not become a 2 MB message
export const fmt = (n) => n.toLocaleString('en-US');

export const isObject = (v) => v !== null && typeof v === 'object' && !Array.isArray(v);

// The value of an own property, or undefined: never one inherited from Object.prototype.
export function own(obj, key) {
  return isObject(obj) && Object.prototype.hasOwnProperty.call(obj, key) ? obj[key] : undefined;
}

const isNumber = (v) => typeof v === 'number';

// A value as a message shows it: numbers as String() writes them, strings quoted and cut, containers by size.
export function shown(v) {
  if (v === null || v === undefined) return 'null';
  if (typeof v === 'boolean') return v ? 'true' : 'false';
  if (isNumber(v)) return String(v);
  if (typeof v === 'string') {
    const chars = Array.from(v);
    return JSON.stringify(chars.slice(0, SHOWN_CHARS).join('')) + (chars.length > SHOWN_CHARS ? '…' : '');
  }
  if (Array.isArray(v)) return `a list of ${fmt(v.length)}`;
  return 'an object';
}

// Two aliases' values agree as JSON reads them (true is not 1; objects by their JSON).
function sameValue(a, b) {
  if (isNumber(a) || isNumber(b)) return isNumber(a) && isNumber(b) && String(a) === String(b);
  return typeof a === typeof b && Array.isArray(a) === Array.isArray(b) && JSON.stringify(a) === JSON.stringify(b);
}

function familiesText(families) {
  return families === '*' ? 'every family' : families.join(', ');
}

export class Reader {
  constructor(config, table, family) {
    const text = own(config, 'text_config');
    this.table = table;
    this.top = config;
    this.cfg = isObject(text) ? text : config;
    this.prefix = isObject(text) ? 'text_config.' : '';
    this.family = family;
    this.used = [];
    this.errors = [];
    this.flags = [];
  }

  error(key, message) { this.errors.push({ field: this.prefix + key, message }); }

  flag(key, message) { this.flags.push({ field: this.prefix + key, message }); }

  // The file's value at `key` ("a.b" reads inside an object), null when absent or null.
  get(key) {
    let node = this.cfg;
    for (const part of key.split('.')) {
      node = own(node, part);
      if (node === undefined) return null;
    }
    return node;
  }

  has(key) { return this.get(key) !== null; }

  note(name, key, value, def = '') {
    const u = { name, key: this.prefix + key, value };
    if (def) u.default = def;
    this.used.push(u);
  }

  check(key, v, lo, hi) {
    if (!isNumber(v) || !Number.isInteger(v) || v < lo || v > hi) {
      this.error(key, `must be a whole number from ${fmt(lo)} to ${fmt(hi)} (got ${shown(v)})`);
      return null;
    }
    return v;
  }

  // An integer read from `key` and recorded as used; a missing key takes `def` only when `why` says whose.
  whole(key, name, lo = 1, hi = BIG, def = null, why = '') {
    const v = this.get(key);
    if (v === null) {
      if (why) { this.note(name, key, def, why); return def; }
      this.error(key, `missing: needed for ${name}`);
      return null;
    }
    const n = this.check(key, v, lo, hi);
    if (n !== null) this.note(name, key, n);
    return n;
  }

  knownForFamily(key, families) {
    if (families !== '*' && this.family && !families.includes(this.family)) {
      this.flag(key, `read, though this calculator knows ${key} only in ${familiesText(families)} configs`);
    }
  }

  // One fact from the first alias the file sets (config-keys.json order); aliases that disagree are an error,
  // an alias outside its families is flagged, a missing fact takes the family's transformers default.
  fact(fact, lo = 1, hi = BIG, def = null, why = '', skip = []) {
    const spec = this.table.facts[fact];
    const present = spec.aliases.filter((a) => !skip.includes(a.key) && this.has(a.key));
    if (!present.length) {
      const familyDefault = own(this.table.defaults, this.family) || {};
      const standard = spec.standard;
      if (own(familyDefault, standard) !== undefined) {
        this.note(spec.name, standard, familyDefault[standard], familyDefault.source);
        return familyDefault[standard];
      }
      if (why) { this.note(spec.name, standard, def, why); return def; }
      this.error(standard, `missing: needed for ${spec.name} (looked for ${spec.aliases.map((a) => a.key).join(' / ')})`);
      return null;
    }
    const values = present.map((a) => [a.key, this.get(a.key)]);
    if (values.slice(1).some(([, v]) => !sameValue(values[0][1], v))) {
      const said = values.map(([k, v]) => `${k} = ${shown(v)}`).join(' and ');
      this.error(present[0].key, `${said} disagree about the ${spec.name}`);
      return null;
    }
    this.knownForFamily(present[0].key, present[0].families);
    return this.whole(present[0].key, spec.name, lo, hi);
  }
}
