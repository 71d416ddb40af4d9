// Placeholder figure: replaced by its owner.
export function mount(el) {}
export function destroy() {}
