# Sandbox code hunting for the server's files. $1: the data dir, $2: the server's pid,
# $3: the checkout. Prints its mount table, then what it found (text, and a line
# "READ <path>" per file it could open); exits 0 only if it read a file at $1.
echo "mounts:"
cut -d' ' -f4,5 /proc/self/mountinfo
echo "end of mounts"
found=1
for f in "$1/palaestra.sqlite3" "$1/admin.token" "$1"/packs/sha256/*/tasks.jsonl; do
  if head -c 1 "$f" >/dev/null 2>&1; then
    head -c 4096 "$f" | tr -c '[:print:]\n' '.'; echo "READ $f"; found=0
  fi
done
ls -laR "$1" "$(dirname "$1")" "$3" /root /home 2>/dev/null | head -n 500
for p in /proc/1 "/proc/$2" /proc/[0-9]*; do
  tr '\0' '\n' 2>/dev/null <"$p/environ"
  tr '\0' ' ' 2>/dev/null <"$p/cmdline"
done
find / \( -path /proc -o -path /sys -o -path /usr \) -prune -o \( -name 'palaestra.sqlite3*' \
  -o -name admin.token -o -name tasks.jsonl \) -print 2>/dev/null | head -n 50 | while read -r f; do
  if head -c 1 "$f" >/dev/null 2>&1; then
    head -c 4096 "$f" | tr -c '[:print:]\n' '.'; echo "READ $f"
  fi
done
exit $found
