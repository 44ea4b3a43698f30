#!/bin/sh
# Beam's Python boot binary for --environment_type=PROCESS on Prism 2.77.0, which starts the
# command with --id='<worker id>', the quotes kept in the argument; the boot binary then asks
# for the id with the quotes and Prism refuses it ("not registered in worker pool"). This
# hands it --id=<worker id>. The boot binary's path is in $THRESHER_BEAM_BOOT.
first=1
for a in "$@"; do
  if [ "$first" = 1 ]; then set --; first=0; fi
  case "$a" in
    --id=\'*\') a="--id=$(printf '%s' "$a" | sed "s/^--id='//; s/'\$//")" ;;
  esac
  set -- "$@" "$a"
done
exec "$THRESHER_BEAM_BOOT" "$@"
