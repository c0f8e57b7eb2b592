// `npm start`: the demo payments API on :9000 and fencegate in front of it
// on :8080, with the example configuration and a SQLite file in this folder.
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { startDemoUpstream } from './demo-upstream.js';

const root = fileURLToPath(new URL('..', import.meta.url));
// One line, like the gateway's own start-up errors, not a stack trace: the
// usual cause is a port already taken (an earlier `npm start` still running).
const upstream = await startDemoUpstream({ port: 9000 }).catch((err) => {
  const why = err?.code === 'EADDRINUSE' ? 'port 9000 is already in use (is another `npm start` running?)' : String(err?.message ?? err);
  console.error(`npm start: the demo upstream could not start: ${why}`);
  process.exit(1);
});
console.log(JSON.stringify({ msg: 'demo-upstream listening', url: 'http://127.0.0.1:9000' }));

const gateway = spawn(process.execPath, ['dist/entry/cli.js', 'serve', '--config', 'examples/fencegate.example.json'], {
  cwd: root,
  stdio: 'inherit',
});
const stop = (signal) => gateway.kill(signal);
process.on('SIGINT', () => stop('SIGINT'));
process.on('SIGTERM', () => stop('SIGTERM'));
gateway.on('exit', (code) => {
  upstream.close();
  process.exit(code ?? 0);
});
