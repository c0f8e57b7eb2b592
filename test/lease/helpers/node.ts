/**
 * Running the lease module outside vitest: the heartbeat thread and child
 * worker processes are plain Node, so they get the TypeScript loader.
 */
import { fileURLToPath } from 'node:url';

export const TS_REGISTER = new URL('./ts-register.mjs', import.meta.url).href;

/** Node flags for a thread or process that runs the TypeScript sources. */
export const TS_EXEC_ARGV = ['--import', TS_REGISTER];

/** A path under test/lease/helpers. */
export const helperPath = (name: string) => fileURLToPath(new URL(`./${name}`, import.meta.url));
