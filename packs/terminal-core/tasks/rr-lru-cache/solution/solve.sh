#!/bin/bash
set -euo pipefail
cd /work
python3 - <<'PY'
p = "cachelib/lru.py"
s = open(p).read()
s = s.replace('''            return default
        return self._data[key]''', '''            return default
        self._order.remove(key)
        self._order.append(key)
        return self._data[key]''')
s = s.replace('''            self._data[key] = value
            return''', '''            self._data[key] = value
            self._order.remove(key)
            self._order.append(key)
            return''')
open(p, "w").write(s)
PY
