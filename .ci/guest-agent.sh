#!/bin/sh
# .ci/guest-agent.sh — the static guest agent, for the test fixtures and the library tests
# that build images without the `vse` binary (which embeds the same build: see build.rs).
# Prints its path.
exec "$(dirname "$0")/static-build.sh" vse-guest-agent vse-guest-agent
