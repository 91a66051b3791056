# The wheel builder: an environment's system stage plus a C/C++ compiler and the
# default python3's headers, for building a wheel from an sdist PyPI has no wheel
# of for this interpreter. It runs with no network, as uid 1000; its inputs (the
# sdist, its build dependencies' wheels) are mounted read-only. Debian's numpy
# headers leave the interpreter's include folder (/usr/include/python3.X/numpy, a
# link python3-numpy puts there, is searched before numpy.get_include()): an
# extension is compiled against the numpy of its build requirements (the store's),
# not Debian's, which the installed packages may replace.
ARG SYSTEM
FROM ${SYSTEM}
USER root
RUN set -e; export DEBIAN_FRONTEND=noninteractive; \
    apt-get -o Acquire::Check-Valid-Until=false update; \
    apt-get install -y --no-install-recommends build-essential python3-dev pkg-config; \
    rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb /var/cache/apt/*.bin; \
    rm -f /usr/include/python3*/numpy
LABEL org.ale.image=env-builder
