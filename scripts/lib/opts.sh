# Sourced by the bench and simulation scripts: their option loop, one for
# all of them.
#
#   . scripts/lib/opts.sh                 # first: declares the two tables
#   OPT_VALUE+=([--ranks]=ranks ...)      # option -> the variable it sets
#   OPT_FLAG+=([--quick]=quick ...)       # option -> a variable set to 1
#   OPT_REST=1                            # "--" ends the options
#   opts_parse "$@"; set -- "${rest[@]}"
#
# -h/--help prints the script's head comment (its lines after the first,
# up to the first line that is not a comment). Anything else ends the
# script through the caller's die(), naming the option.
declare -A OPT_VALUE=() OPT_FLAG=()
OPT_REST=0
opts_parse() {
  rest=()
  while [ $# -gt 0 ]; do
    if [[ $1 == --[a-z]* ]] && [ -n "${OPT_VALUE[$1]-}" ]; then
      [ $# -ge 2 ] || die "$1 needs a value"
      printf -v "${OPT_VALUE[$1]}" '%s' "$2"
      shift 2
    elif [[ $1 == --[a-z]* ]] && [ -n "${OPT_FLAG[$1]-}" ]; then
      printf -v "${OPT_FLAG[$1]}" '%s' 1
      shift
    elif [ "$1" = -h ] || [ "$1" = --help ]; then
      awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
      exit 0
    elif [ "$1" = -- ] && [ "$OPT_REST" = 1 ]; then
      shift
      rest=("$@")
      return 0
    else
      die "unknown option '$1' (--help lists them)"
    fi
  done
}
