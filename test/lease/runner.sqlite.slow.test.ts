import { runnerSuite } from './runner-suite.js';
import { sqliteDatabase } from './helpers/stores.js';

runnerSuite('SQLite', sqliteDatabase);
