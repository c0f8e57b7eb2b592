/** Types for scripts/bundle-console.mjs (imported by test/console/assets.test.ts). */
export interface ConsoleSources {
  html: string;
  css: string;
  js: string;
}
export declare const CONSOLE_DIR: string;
export declare const GENERATED: string;
export declare const SCRIPTS: string[];
export declare function readSources(dir?: string): ConsoleSources;
export declare function render(sources: ConsoleSources): string;
