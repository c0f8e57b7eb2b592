/**
 * A switch for the name folding of src/core/json-duplicates.ts, for the
 * negative controls of the case-insensitive checks (DESIGN §3.4): a test
 * file mocks the module with `foldSwitched` and sets `fold.mode`.
 *
 * @example
 * vi.mock('../../src/core/json-duplicates.js', async (original) => (await import('../helpers/fold-switch.js')).foldSwitched(await original()));
 * import { fold } from '../helpers/fold-switch.js';
 * fold.mode = 'none'; // names compared as written: the checks are off
 */
import type * as JsonDuplicates from '../../src/core/json-duplicates.js';

/** `real`: the gateway's folding; `lower`: `toLowerCase` only; `none`: no folding at all. */
export const fold: { mode: 'real' | 'lower' | 'none' } = { mode: 'real' };

/** The module as it is, with every use of the folding going through `fold.mode`. */
export function foldSwitched(real: typeof JsonDuplicates): typeof JsonDuplicates {
  const current = (n: string) => (fold.mode === 'real' ? real.foldName(n) : fold.mode === 'lower' ? n.toLowerCase() : n);
  return {
    ...real,
    foldName: current,
    scanPointer: (text: string, tokens: string[]) => real.scanPointer(text, tokens, current),
    duplicateOnPointerPath: (text: string, tokens: string[]) => real.duplicateOnPointerPath(text, tokens, current),
  };
}
