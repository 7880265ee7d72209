#!/bin/sh
# Byte-compile, on every core at once, what the test suite imports from the virtual
# environment given (default .venv): the processes the suite starts then load every module
# without compiling it. Left out (compiled on first import, if ever): the Hugging Face
# architectures the tests never build (all but auto, gpt2, llama and bert: most of
# transformers' files), pip and setuptools, the packages' own tests, pygments' lexers, and one
# torch helper written in Python 3.12 syntax.
set -e
python -m compileall -q -j 0 \
  -x '/py312|/transformers/models/(?!(auto|gpt2|llama|bert)/)|/site-packages/(pip|setuptools)/|/tests?/|/pygments/lexers/' \
  "${1:-.venv}/lib"
