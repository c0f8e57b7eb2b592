import { jobStoreConformance } from './conformance.js';
import { sqliteDatabase } from './helpers/stores.js';

jobStoreConformance('SQLite (better-sqlite3, WAL file)', sqliteDatabase);
