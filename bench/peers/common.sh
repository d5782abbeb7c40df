# Sourced by the other .sh scripts: shared launcher settings.
# Debian torch 1.13 + Python 3.11: torchrun's default --redirects/--tee "0" parses to None
# (IntFlag zero member not iterable in 3.11) and crashes; a map naming a non-existent
# local rank (9) yields Std.NONE for every real rank, i.e. the intended default.
TORCHRUN="/usr/bin/torchrun --standalone --redirects 9:1 --tee 9:1"
MPIRUN="mpirun --allow-run-as-root --oversubscribe"
PY=/usr/bin/python3
# Outputs (built binaries, hyperfine JSON) go to $PEERS_OUT, else a new temporary directory.
S=${PEERS_OUT:-$(mktemp -d -t peers-out.XXXXXX)}; mkdir -p "$S"; export PEERS_OUT=$S
