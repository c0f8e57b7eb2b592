export * from './types.js';
export * from './errors.js';
export { createSqliteJobStore, type SqliteJobStoreOptions } from './sqlite/store.js';
export { createPostgresJobStore, type PostgresJobStoreOptions } from './postgres/store.js';
export { openJobStore, type OpenJobStoreOptions } from './open.js';
