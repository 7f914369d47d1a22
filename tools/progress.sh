# Progress for the Go builds of tools/*/ (sourced, not run): the step counter, the elapsed time, and
# a package count read from `go build -v`. A cold build compiles thousands of packages for tens of
# minutes on a small machine; without these it prints nothing for most of that time.
# The caller sets $label (the prefix of every line) and $steps (how many steps it has).
start=$(date +%s)
step_no=0

# The elapsed time since the script started, as 12m05s.
elapsed() {
  local s=$(($(date +%s) - start))
  printf '%dm%02ds' $((s / 60)) $((s % 60))
}

# Announces the next step: "label: [k/n] what (elapsed)".
step() {
  step_no=$((step_no + 1))
  echo "$label: [$step_no/$steps] $* ($(elapsed))"
}

# Reads `go build -v` (one package path per line, as each is compiled; cached ones are not named)
# and prints a count every 100 packages, of $1 when given, and every 50 modules downloaded; compiler
# and linker messages pass as they are.
progress() {
  local of=${1:+/$1} n=0 d=0 line
  while IFS= read -r line; do
    case $line in
      "go: downloading "*) d=$((d + 1)); [ $((d % 50)) -ne 0 ] || echo "$label:   $d modules downloaded ($(elapsed))" ;;
      *" "* | *:*) echo "$line" ;;
      *) n=$((n + 1)); [ $((n % 100)) -ne 0 ] || echo "$label:   $n$of packages compiled ($(elapsed))" ;;
    esac
  done
  echo "$label:   $n packages compiled, the rest from the Go build cache ($(elapsed))"
}

# Reads the stderr of a go command that fetches modules ("go: downloading ..." for each) and prints a
# count every 50 and at the end; anything else (errors) passes as it is.
downloads() {
  local d=0 line
  while IFS= read -r line; do
    case $line in
      "go: downloading "*) d=$((d + 1)); [ $((d % 50)) -ne 0 ] || echo "$label:   $d modules downloaded ($(elapsed))" ;;
      *) echo "$line" ;;
    esac
  done
  echo "$label:   $d modules downloaded ($(elapsed))"
}
