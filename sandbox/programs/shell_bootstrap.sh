exec 60<&@CONTROL_IN@ 61>&@STATUS_OUT@ 62>&1 2>&1 @CLOSE@
trap : INT
__p_v=
builtin printf 'ready\0' >&61
while :; do
  { IFS=' ' builtin read -r -u 60 __p_n __p_l || builtin exit 0
  if (( __p_l > @LONG_COMMAND@ )) && __p_h=$(builtin command -v head); then
    __p_c=$("$__p_h" -c "$__p_l" <&60; builtin echo .); __p_c=${__p_c%.}
    IFS= builtin read -r -d '' -u 60 __p_x
  else
    IFS= builtin read -r -d '' -u 60 __p_c
  fi; } 2>/dev/null
  builtin eval "$__p_v$__p_c" </dev/null >&62 2>&1 60<&- 61>&- 62>&-
  { __p_r=$?; __p_v=; [[ $- == *x* ]] && { __p_v='set -x;'; set +x; }
  builtin printf '\036P%s\037' "$__p_n" >&62
  builtin printf '%s %s %s\0' "$__p_n" "$__p_r" "$PWD" >&61; } 2>/dev/null
done
