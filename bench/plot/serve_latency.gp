# Latency against concurrency: TTFT, TPOT and ITL, median (solid) and p99
# (dashed), one colour per run. Variables: files, labels, out, title, subtitle.
# Data columns: 1 concurrency, 4/5 TTFT p50/p99, 6/7 TPOT p50/p99, 8/9 ITL p50/p99 (ms).
set terminal pngcairo size 1500,500 noenhanced font 'DejaVu Sans,11'
set output out
set multiplot layout 1,3 title title."\n".subtitle font ',12'
set logscale x 2
set logscale y
set xlabel 'concurrency (requests in flight)'
set grid xtics ytics mytics lc rgb '#dddddd'
set key top left box opaque width 2
set style data linespoints
array what[3] = ['time to first token (TTFT)', 'time per output token (TPOT)', 'inter-token latency (ITL)']
do for [m=1:3] {
    set title what[m]
    set ylabel 'ms'
    c = 2 + 2 * m
    plot for [i=1:words(files)] word(files, i) using 1:c lw 2 pt 7 ps 1 lc i title word(labels, i).' p50', \
         for [i=1:words(files)] word(files, i) using 1:(column(c + 1)) lw 1.5 dt 2 pt 6 ps 1 lc i title word(labels, i).' p99'
}
unset multiplot
