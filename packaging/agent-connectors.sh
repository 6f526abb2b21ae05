#!/bin/sh
# agent-connectors on the Node this package carries, whatever node is on PATH (docs/packaging.md).
exec @NODE@ @CLI@ "$@"
