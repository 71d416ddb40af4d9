// The calculator's byte read-out: the exact count, then the binary size with its unit in an <abbr>
// that names it ("1,073,741,824 B = 1 GiB", "5,033,164,800 B ≈ 4.69 GiB").
import { html } from '../shared/dom.js';
import { UNIT_NAMES, binary, formatBytes } from '../shared/format.js';

export function bytesNode(n) {
  const b = binary(n);
  const wrap = html('span', { cls: 'kvc-bytes' });
  wrap.append(html('span', { cls: 'kvc-exact', text: formatBytes(n) }));
  if (b.unit === 'B') return wrap;
  const approx = html('span', { cls: 'kvc-bin', text: `${b.exact ? '=' : '≈'} ${b.number} ` });
  const abbr = html('abbr', { text: b.unit });
  abbr.title = UNIT_NAMES[b.unit];
  approx.append(abbr);
  wrap.append(' ', approx);
  return wrap;
}
