// The CLI's help texts, one per command (`fencegate <command> --help`).
// docs/cli.md shows the same usage lines; keep the two in step.
import { reasonLines } from './cli-reasons.js';

export const HELP = `fencegate — a fencing-aware side-effect gateway

Usage:
  fencegate serve   --config FILE [--port N] [--db PATH | --database-url URL] [--workers N]
  fencegate migrate (--config FILE | --db PATH | --database-url URL) [--lease]
  fencegate audit   (--url URL [--token T] | --db PATH | --config FILE) [--entity E] [--reason R]
                    [--caller C] [--since 2h] [--until T] [--limit N] [--format table|csv|ndjson]
  fencegate audit commands (same sources) [--entity E] [--key K] [--route NAME] [--caller C] [--since 2h]
                    [--until T] [--limit N] [--format table|csv|ndjson]
  fencegate token   --config FILE --sub NAME [--scope "fencegate:proxy"] [--ttl 1h]
  fencegate resolve-unknown --url URL [--token T] --route NAME --from T --to T [--note TEXT] [--dry-run]
  fencegate config  (schema | check [--config FILE])
  fencegate --help  (fencegate <command> --help: that command's options)
  fencegate --version

Environment:
  FENCEGATE_LOG_LEVEL  debug | info (default) | warn | error | silent (any case; empty is info; another word stops start-up)
  FENCEGATE_TOKEN      bearer token for --url commands (keeps it out of ps)
  DATABASE_URL         PostgreSQL store, as --database-url
  FENCEGATE_CONFIG     configuration file when --config is not given (serve, migrate)
  PORT                 serve: listen port when --port is not given (wins over listen.port)
  FENCEGATE_WORKERS    serve: worker processes when --workers is not given (default: one per core, at most 8)
  FENCEGATE_DEBUG=1    print the stack trace of an error
`;

export const SERVE_HELP = `fencegate serve — run the gateway

Usage:
  fencegate serve --config FILE [--port N] [--db PATH | --database-url URL] [--workers N]

Options:
  --config FILE        JSON configuration (docs/configuration.md); default FENCEGATE_CONFIG
  --port N             override listen.port and PORT (0: any free port)
  --db PATH            use this SQLite file as the store (overrides store)
  --database-url URL   use this PostgreSQL database (also DATABASE_URL)
  --workers N          N gateway processes on one socket and one store (default
                       FENCEGATE_WORKERS, else one per core, at most 8; 1: one process)

Environment: FENCEGATE_CONFIG (the file, without --config), PORT (the port,
without --port; wins over listen.port), and every variable a "{ "env": … }"
in the configuration names.

Migrations run at start-up. SIGTERM or SIGINT drain in-flight requests and
pending finishes (for at most drainTimeout), then exit; a second signal exits
at once. SIGHUP re-reads the configuration (docs/deploy.md §4). With
--workers the first process only forwards these signals to its workers,
restarts a worker that dies, and sums the workers' /metrics (docs/cli.md).
`;

export const CONFIG_HELP = `fencegate config — the configuration file

Usage:
  fencegate config schema                 print its JSON Schema (examples/fencegate.schema.json)
  fencegate config check [--config FILE]  validate it as serve would, opening nothing

check reads FENCEGATE_CONFIG without --config, and resolves every
"{ "env": … }" from the environment, key and TLS files included (docs/deploy.md).
`;

export const MIGRATE_HELP = `fencegate migrate — create or update the store's tables

Usage:
  fencegate migrate (--config FILE | --db PATH | --database-url URL) [--lease]

Options:
  --config FILE        the store of this configuration
  --db PATH            a SQLite file
  --database-url URL   a PostgreSQL database (also DATABASE_URL)
  --lease              the lease module's schema (tool_jobs) instead of the gateway's

A D1 store is migrated with wrangler: npx wrangler d1 migrations apply DB.
Safe to run while other processes migrate or serve.
`;

export const AUDIT_HELP = `fencegate audit — read the rejection log

Usage:
  fencegate audit --url URL [--token T] [filters] [--format table|csv|ndjson]
  fencegate audit (--db PATH | --config FILE) [filters] [--format table|csv|ndjson]

Against a running gateway (--url, token from --token or FENCEGATE_TOKEN, with
the fencegate:audit scope), or straight against its store (--db, or the store
of --config). Every matching row is streamed, newest first.

Filters:
  --entity E        only this entity
  --reason R        ${reasonLines('                    ')}
  --caller C        only this caller (token sub)
  --tool NAME       only refused calls of this MCP tool (tools/call)
  --since T         ISO 8601 time, or a duration back from now (2h, 30m, 7d)
  --until T         same
  --limit N         at most N rows (default: all)
  --admin-prefix P  the gateway's adminPrefix (default /_fencegate, or the config's)

The command log (accepted commands and how each ended): fencegate audit commands --help
`;

export const AUDIT_COMMANDS_HELP = `fencegate audit commands — read the command log

Usage:
  fencegate audit commands --url URL [--token T] [filters] [--format table|csv|ndjson]
  fencegate audit commands (--db PATH | --config FILE) [filters] [--format table|csv|ndjson]

One row per outcome of a request the gateway decided on: completed, released
or outcome_unknown (with the status the caller got: the upstream's, or 502,
503, 504), late-finish, and the transient refusals entity-busy,
idempotency-in-progress and payload-too-large. Refusals are in the rejection
log (fencegate audit). Against a running gateway (--url, with the
fencegate:audit scope) or straight against its store; newest first.

Filters:
  --entity E        only this entity
  --key K           only this idempotency key
  --route NAME      only this route
  --caller C        only this caller (token sub)
  --since T         ISO 8601 time, or a duration back from now (2h, 30m, 7d)
  --until T         same
  --limit N         at most N rows (default: all)
  --admin-prefix P  the gateway's adminPrefix (default /_fencegate, or the config's)
`;

export const TOKEN_HELP = `fencegate token — mint a development JWT from the configured HS256 secret

Usage:
  fencegate token --config FILE --sub NAME [--scope "fencegate:proxy"] [--ttl 1h]

Options:
  --sub NAME        the caller's name (token sub)
  --scope S         space-separated scopes; default fencegate:proxy. The others:
                    fencegate:audit (read the admin API), fencegate:admin (resolve)
  --ttl D           lifetime, e.g. 15m, 1h, 7d (default 1h)

Signs with auth.secret (HS256) and the config's issuer and audience. Prints the
token on stdout. For development and tests: production tokens come from your
identity provider. A gateway without "auth" needs no token: it checks none,
and its admin API answers on a loopback listener.
`;

export const RESOLVE_UNKNOWN_HELP = `fencegate resolve-unknown — settle a route's outcome_unknown records as released

Usage:
  fencegate resolve-unknown --url URL [--token T] --route NAME --from T --to T [--note TEXT] [--dry-run]

Every outcome_unknown record of the route created in [from, to) is released
(the next retry is forwarded again), each one conditionally and with its own
operator-action row; at most 10000 per run (the answer says whether more
remain: run it again). Use it when the upstream is known not to have acted,
e.g. it was down. Needs the fencegate:admin scope when the gateway has auth.

Options:
  --route NAME      the route's name in the config
  --from T, --to T  ISO 8601 times with Z or an offset, or durations back from now (2h, 30m)
  --note TEXT       why, kept in every operator-action row
  --dry-run         count and list the records, change nothing
  --admin-prefix P  the gateway's adminPrefix (default /_fencegate)
`;
