// `node --import <this file>`: the process behaves as if no @opentelemetry package were installed.
import { register } from 'node:module';

const hook = `export async function resolve(specifier, context, next) {
  if (specifier.startsWith('@opentelemetry/')) throw Object.assign(new Error('Cannot find package ' + specifier), { code: 'ERR_MODULE_NOT_FOUND' });
  return next(specifier, context);
}`;
register(`data:text/javascript,${encodeURIComponent(hook)}`);
