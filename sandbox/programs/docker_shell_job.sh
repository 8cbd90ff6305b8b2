__g=$1
for p in /proc/[0-9]*; do
  [ "$p" = "/proc/$$" ] && continue
  u=; g=
  while read -r k a _; do case $k in Uid:) u=$a;; Gid:) g=$a; break;; esac; done 2>/dev/null < "$p/status"
  [ "$u" = @UID@ ] && [ "$g" = "$__g" ] || continue
  read -r l 2>/dev/null < "$p/stat" || continue
  set -- ${l##*) }
  __s=$1; __pp=$2; shift 19; echo "${p#/proc/} $__pp $1 $__s"
done
echo .
read -r sig pids || exit 0
[ -z "$pids" ] || kill -"$sig" $pids 2>/dev/null
echo done
