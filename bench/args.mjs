// Command-line options of the benchmark scripts: `--name value` and `--flag`.
const args = process.argv.slice(2);

/** The value after `--name`, or `dflt` when the option is absent. */
export const option = (name, dflt) => {
  const i = args.indexOf(`--${name}`);
  return i >= 0 ? args[i + 1] : dflt;
};

/** Whether `--name` was given. */
export const flag = (name) => args.includes(`--${name}`);
