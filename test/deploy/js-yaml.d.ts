// js-yaml (4.x, installed through graphile-worker's cosmiconfig) ships no types; the deploy tests use `load` only.
declare module 'js-yaml' {
  const yaml: { load(text: string): unknown };
  export default yaml;
}
