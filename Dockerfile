# fencegate: the gateway as a container (docs/deploy.md §7).
#
#   docker build -t fencegate .
#   docker run -p 8080:8080 -v ./fencegate.json:/etc/fencegate/fencegate.json:ro \
#     -v fencegate-data:/var/lib/fencegate fencegate
#
# Three stages: `build` compiles with the dev dependencies, `deps` installs
# the production dependencies alone into a clean directory, `run` is Node
# with those two and nothing else, as a non-root user.
# test/deploy/dockerfile.test.ts runs these stages' commands outside Docker.

FROM node:20.20-bookworm AS build
WORKDIR /app
COPY . .
# `prepare` builds too; the explicit build says what this stage is for.
RUN npm ci --no-audit --no-fund
RUN npm run build

FROM node:20.20-bookworm AS deps
WORKDIR /deps
COPY package.json package-lock.json ./
# No scripts: `prepare` would build from sources this stage does not have.
# better-sqlite3's own install (a prebuilt binary, or a compile with the
# toolchain of this full image) is run on its own.
RUN npm ci --omit=dev --ignore-scripts --no-audit --no-fund
RUN npm rebuild better-sqlite3

FROM node:20.20-bookworm-slim AS run
ENV NODE_ENV=production \
    FENCEGATE_CONFIG=/etc/fencegate/fencegate.json \
    PORT=8080
WORKDIR /app
COPY --from=deps /deps/node_modules ./node_modules
COPY --from=build /app/package.json ./package.json
COPY --from=build /app/dist ./dist
COPY --from=build /app/migrations ./migrations
COPY --from=build /app/src/store/postgres/sql ./src/store/postgres/sql
COPY --from=build /app/examples/fencegate.schema.json ./examples/fencegate.schema.json
# The SQLite store's directory, writable by the gateway's user only; a
# PostgreSQL deployment leaves it empty.
RUN mkdir -p /var/lib/fencegate /etc/fencegate && chown node:node /var/lib/fencegate
VOLUME ["/var/lib/fencegate"]
USER node
EXPOSE 8080
# Liveness, with node (the slim image has no curl): 200 while the process
# answers, also while it starts (migrations) and drains; readiness is
# /_fencegate/ready, for an orchestrator's own probe (docs/deploy.md §3).
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
  CMD ["node", "-e", "fetch('http://127.0.0.1:' + (process.env.PORT || 8080) + '/_fencegate/health').then((r) => process.exit(r.ok ? 0 : 1), () => process.exit(1))"]
# SIGTERM drains (drainTimeout, default 30s): give `docker stop -t` more than that.
STOPSIGNAL SIGTERM
CMD ["node", "dist/entry/cli.js", "serve"]
