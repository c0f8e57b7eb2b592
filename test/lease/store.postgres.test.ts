import { describe } from 'vitest';
import { jobStoreConformance } from './conformance.js';
import { POSTGRES_URL, postgresDatabase } from './helpers/stores.js';

describe.skipIf(!POSTGRES_URL)('PostgreSQL', () => {
  jobStoreConformance('PostgreSQL (pg pool)', postgresDatabase);
});
