# Exhaust the sandbox's own space, then submit: fill every size-limited folder the agent
# can write (the workdir, /tmp, HOME) until the disk is full, then create files until the
# inodes run out (for at most 4 s a folder). The verdict must be reward 0 with a failure class (the
# agent did this), never void. A folder with more than 4 GiB free is not a sandbox's quota
# and is left alone.
seen=""
for d in "$(pwd)" /tmp "$HOME"; do
  [ -d "$d" ] && [ -w "$d" ] || continue
  case " $seen " in *" $d "*) continue ;; esac
  seen="$seen $d"
  avail=$(df -Pk "$d" 2>/dev/null | awk 'NR==2 {print $4}')
  [ -n "$avail" ] && [ "$avail" -lt 4194304 ] || continue
  # in files no larger than the sandbox's file size limit (ulimit -f, in KiB), until ENOSPC
  kib=$(ulimit -f); [ "$kib" = unlimited ] && kib=16384; [ "$kib" -gt 16384 ] && kib=16384
  n=$((avail / kib + 2)); i=0; bs=1; [ "$kib" -ge 64 ] && bs=64
  while [ $i -lt $n ] && dd if=/dev/zero of="$d/.palaestra-fill$i" bs=${bs}K count=$((kib / bs)) 2>/dev/null; do
    i=$((i + 1))
  done
  mkdir -p "$d/.palaestra-inodes" 2>/dev/null || continue
  # xargs stops at the first batch that fails (exit 255): the inodes are gone
  timeout 4 sh -c 'seq 1 500000 | sed "s|^|$1/f|" | xargs -n 2000 sh -c "touch \"\$@\" 2>/dev/null || exit 255" sh' sh "$d/.palaestra-inodes"
done
true
