import { existsSync, readdirSync, readlinkSync } from 'node:fs';
import { createServer } from 'node:net';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { ConfigError, parseConfig } from '../../src/config/load.js';
import { startGateway } from '../../src/entry/node.js';
import { silentLogger } from '../../src/http/logger.js';
import { tempDir } from '../helpers/gateway.js';

// A start-up that fails must not leave the SQLite file open behind the error
// (a library user who catches it and starts again would hold two handles).
// Linux-only check: the open descriptors of this process in /proc/self/fd.

const tmp = tempDir();
afterAll(() => tmp.cleanup());

const openHandles = (path: string) =>
  readdirSync('/proc/self/fd').filter((fd) => {
    try {
      return readlinkSync(`/proc/self/fd/${fd}`).startsWith(path);
    } catch {
      return false;
    }
  }).length;

const route = { name: 'p', match: { path: '/p/*' }, upstream: 'http://127.0.0.1:9' };

describe.skipIf(!existsSync('/proc/self/fd'))('a failed start-up closes what it opened', () => {
  it('a missing upstream credential: ConfigError, and the store is closed', async () => {
    const db = join(tmp.dir, 'env.db');
    const config = parseConfig({ listen: { port: 0 }, store: { sqlite: db }, routes: [{ ...route, upstreamHeaders: { Authorization: { env: 'FENCEGATE_TEST_NOT_SET' } } }] });
    await expect(startGateway({ config, logger: silentLogger, env: {} })).rejects.toBeInstanceOf(ConfigError);
    expect(openHandles(db)).toBe(0);
  });

  it('a port in use: the listen error, and the store is closed', async () => {
    const squatter = createServer();
    await new Promise<void>((r) => squatter.listen(0, '127.0.0.1', () => r()));
    try {
      const db = join(tmp.dir, 'port.db');
      const config = parseConfig({ listen: { host: '127.0.0.1', port: (squatter.address() as AddressInfo).port }, store: { sqlite: db }, routes: [route] });
      await expect(startGateway({ config, logger: silentLogger })).rejects.toThrow(/EADDRINUSE/);
      expect(openHandles(db)).toBe(0);
    } finally {
      squatter.close();
    }
  });
});
