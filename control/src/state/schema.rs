//! The schema. `CHECK` constraints keep the pools and states valid even if a future version
//! writes through another path; foreign keys keep the mapping consistent.

pub const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS nodes (
    name        TEXT PRIMARY KEY,
    pool        TEXT NOT NULL CHECK (pool IN ('free', 'allocated', 'defunct')),
    updated_ms  INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS jobs (
    id          TEXT PRIMARY KEY,
    created_ms  INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS vms (
    id               TEXT PRIMARY KEY,
    job              TEXT NOT NULL REFERENCES jobs(id),
    node             TEXT NOT NULL REFERENCES nodes(name),
    mem_max_kib      INTEGER NOT NULL CHECK (mem_max_kib > 0),
    last_migrated_ms INTEGER
);
CREATE TABLE IF NOT EXISTS migrations (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    job          TEXT NOT NULL REFERENCES jobs(id),
    source       TEXT NOT NULL REFERENCES nodes(name),
    source_fate  TEXT NOT NULL CHECK (source_fate IN ('defunct', 'keep', 'free')),
    rule         TEXT NOT NULL,
    reason       TEXT NOT NULL,
    state        TEXT NOT NULL CHECK (state IN ('planned', 'notice_posted', 'ranks_ready',
                                                'migrating', 'done', 'rolled_back')),
    created_ms   INTEGER NOT NULL,
    updated_ms   INTEGER NOT NULL,
    deadline_ms  INTEGER,
    note         TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS migration_moves (
    migration    INTEGER NOT NULL REFERENCES migrations(id),
    vm           TEXT NOT NULL REFERENCES vms(id),
    dest         TEXT NOT NULL REFERENCES nodes(name),
    mem_max_kib  INTEGER NOT NULL,
    ready        INTEGER NOT NULL DEFAULT 0,
    moved        INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (migration, vm)
);
CREATE TABLE IF NOT EXISTS migration_transfers (
    migration    INTEGER NOT NULL REFERENCES migrations(id),
    vm           TEXT NOT NULL,
    storage      TEXT NOT NULL CHECK (storage IN ('shared', 'block-copy')),
    disk_bytes   INTEGER NOT NULL CHECK (disk_bytes >= 0),
    memory_bytes INTEGER NOT NULL CHECK (memory_bytes >= 0),
    total_ms     INTEGER NOT NULL CHECK (total_ms >= 0),
    downtime_ms  INTEGER NOT NULL CHECK (downtime_ms >= 0),
    PRIMARY KEY (migration, vm)
);
CREATE TABLE IF NOT EXISTS migration_events (
    migration  INTEGER NOT NULL REFERENCES migrations(id),
    at_ms      INTEGER NOT NULL,
    state      TEXT NOT NULL,
    note       TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS latest_samples (
    node   TEXT NOT NULL,
    vm     TEXT NOT NULL DEFAULT '',
    ts_ms  INTEGER NOT NULL,
    json   TEXT NOT NULL,
    PRIMARY KEY (node, vm)
);
CREATE TABLE IF NOT EXISTS requests (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    job         TEXT NOT NULL REFERENCES jobs(id),
    kind        TEXT NOT NULL CHECK (kind IN ('evacuate')),
    node        TEXT NOT NULL REFERENCES nodes(name),
    state       TEXT NOT NULL CHECK (state IN ('pending', 'running', 'done', 'failed',
                                               'no_spare')),
    created_ms  INTEGER NOT NULL,
    updated_ms  INTEGER NOT NULL,
    migration   INTEGER REFERENCES migrations(id),
    note        TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS checkpoints (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    job         TEXT NOT NULL REFERENCES jobs(id),
    state       TEXT NOT NULL CHECK (state IN ('pending', 'running', 'done', 'failed')),
    created_ms  INTEGER NOT NULL,
    updated_ms  INTEGER NOT NULL,
    path        TEXT NOT NULL DEFAULT '',
    note        TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS controllers (
    job        TEXT PRIMARY KEY,
    pid        INTEGER NOT NULL,
    beat_ms    INTEGER NOT NULL,
    period_ms  INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS migrations_active ON migrations(state)
    WHERE state NOT IN ('done', 'rolled_back');
"#;
