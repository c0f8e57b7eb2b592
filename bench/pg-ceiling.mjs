// PostgreSQL's own ceiling for fencegate's shape of work, measured in the
// same run as the gateway (bench/http.mjs, row `pg-ceiling`): each "request"
// is two small write transactions one after the other, as a gateway request
// is one admission and one finish, at the benchmark's concurrency and the
// gateway's pool size, from one Node process. pgbench would do (it is not
// always installed); this loop needs nothing but the `pg` driver.
//
//   1. upsert the entity's fence and insert the record (one statement, like
//      fencegate_admit's entity row and record);
//   2. mark the record completed with a small body (like fencegate_finish).
//
// No plpgsql, no checks: a floor for the database's work, not fencegate's SQL.
import pg from 'pg';

export async function pgCeiling({ url, connections, seconds, pool: poolSize = 20 }) {
  const schema = `fg_ceiling_${process.pid}`;
  const admin = new pg.Client({ connectionString: url });
  await admin.connect();
  await admin.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE; CREATE SCHEMA ${schema};
    CREATE TABLE ${schema}.entities (entity text PRIMARY KEY, fence bigint NOT NULL);
    CREATE TABLE ${schema}.records (key text PRIMARY KEY, entity text NOT NULL, state text NOT NULL, body bytea)`);
  const pool = new pg.Pool({ connectionString: url, max: poolSize });
  const admit = {
    name: 'ceiling_admit',
    text: `WITH e AS (INSERT INTO ${schema}.entities (entity, fence) VALUES ($2, $3) ON CONFLICT (entity) DO UPDATE SET fence = excluded.fence RETURNING 1)
           INSERT INTO ${schema}.records (key, entity, state) SELECT $1, $2, 'in_progress' FROM e`,
  };
  const finish = { name: 'ceiling_finish', text: `UPDATE ${schema}.records SET state = 'completed', body = $2 WHERE key = $1` };
  const body = Buffer.from('{"id":"ch_1","object":"charge"}');
  let n = 0;
  let done = 0;
  let errors = 0;
  const until = performance.now() + seconds * 1000;
  const loop = async () => {
    while (performance.now() < until) {
      const i = ++n;
      try {
        await pool.query({ ...admit, values: [`k-${i}`, `bench:${i % 1000}`, i] });
        await pool.query({ ...finish, values: [`k-${i}`, body] });
        done++;
      } catch {
        errors++;
      }
    }
  };
  const t0 = performance.now();
  await Promise.all(Array.from({ length: connections }, loop));
  const elapsed = (performance.now() - t0) / 1000;
  await pool.end();
  await admin.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
  await admin.end();
  return { rps: done / elapsed, errors };
}
