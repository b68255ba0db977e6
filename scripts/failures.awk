# Prints what libtest printed for each failing test (its `---- NAME stdout ----`
# block), the backtrace frames left out and each block cut to its last 40 lines, so
# that the panic message is kept: scripts/test.sh repeats it at the end of a run.
function flush(    i, from) {
  if (!inblock) return
  from = n > 40 ? n - 40 : 0
  print header
  if (from > 0) print "  [" from " earlier lines left out]"
  for (i = from; i < n; i++) print lines[i]
  print ""
  inblock = 0
}
/^---- .* stdout ----$/ { flush(); inblock = 1; header = $0; n = 0; next }
inblock && /^failures:$/ { flush(); next }
inblock && (/^stack backtrace:$/ || /^ +[0-9]+: / || /^ +at / || /^note: Some details are omitted/) { next }
inblock { lines[n++] = $0 }
END { flush() }
