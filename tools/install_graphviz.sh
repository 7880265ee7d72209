#!/bin/sh
# Install Graphviz's `dot` (for the stage and schedule pictures) where it is missing and this
# machine can: Debian's `graphviz` package through apt-get, as root or with password-less sudo.
# Never fails: without `dot`, pipecompile still writes the pictures' .dot sources and says how
# to draw them.
command -v dot >/dev/null 2>&1 && exit 0
if command -v apt-get >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then run=""; elif sudo -n true 2>/dev/null; then run="sudo -n"; else run=none; fi
  if [ "$run" != none ]; then
    echo "installing Graphviz (apt-get install graphviz) for the pictures..." >&2
    $run apt-get install -y -q graphviz >/dev/null 2>&1 \
      || { $run apt-get update -q >/dev/null 2>&1 && $run apt-get install -y -q graphviz >/dev/null 2>&1; }
  fi
fi
command -v dot >/dev/null 2>&1 || echo "Graphviz's dot is not installed: pictures stay .dot files (install graphviz to draw them)" >&2
exit 0
