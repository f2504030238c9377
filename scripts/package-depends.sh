#!/bin/sh
# The Depends that pin the package to what it was built for (make deb):
# the installed Samba's upstream release (the preload refuses any other)
# and the Python minor version of its C extensions and libpython.
set -eu
samba=$(dpkg-query -W -f='${Version}' samba)
epoch=${samba%%:*}
[ "$epoch" != "$samba" ] || epoch=""
upstream=${samba#*:}
upstream=${upstream%%+*}
upstream=${upstream%%-*}
next=$(echo "$upstream" | awk -F. '{ printf "%d.%d.%d", $1, $2, $3 + 1 }')
prefix=${epoch:+$epoch:}
py=$(/usr/bin/python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
pynext=$(/usr/bin/python3 -c 'import sys; print("%d.%d" % (sys.version_info[0], sys.version_info[1] + 1))')
echo "samba (>= ${prefix}${upstream}), samba (<< ${prefix}${next}~), python3 (>= $py), python3 (<< $pynext)"
