#!/usr/bin/env bash
# Writes back every dirty page and drops the page cache (when this user may), so a benchmark run
# does not pay for the kernel's writeback and reclaim of the previous run's data.
sync
if [[ -w /proc/sys/vm/drop_caches ]]; then echo 3 >/proc/sys/vm/drop_caches; fi
sleep 1
