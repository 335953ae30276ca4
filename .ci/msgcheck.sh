#!/bin/sh
# .ci/msgcheck.sh — builds the statically linked `vse-msgcheck` (barrier/src/bin/vse-msgcheck.rs:
# a message-checking program that calls the barrier library at every step) and prints its path.
# tests/launch_migrate.rs puts it into a `vse build` image through a spec `files:` entry:
#   export VSE_MSGCHECK=$(.ci/msgcheck.sh)
exec "$(dirname "$0")/static-build.sh" vse-barrier vse-msgcheck
