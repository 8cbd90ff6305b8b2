__f() {
  __n=0
  for p in /proc/[0-9]*; do
    [ "$p" = "/proc/$$" ] && continue
    s=; u=; g=
    while read -r k a _; do case $k in State:) s=$a;; Uid:) u=$a;; Gid:) g=$a; break;; esac; done 2>/dev/null < "$p/status"
    [ "$u" = @UID@ ] && [ "$s" != Z ] && [ "$s" != X ] || continue
    @PICK@ || continue
    __n=1
    [ "$1" = k ] && kill -9 "${p#/proc/}" 2>/dev/null
  done
  [ $__n = 1 ]
}
n=0; while __f k && [ $n -lt 200 ]; do wait; n=$((n+1)); done
@FORKBOMB@
! __f
