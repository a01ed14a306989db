# Throughput against concurrency, one line per run (speculative vs plain).
# Variables (gnuplot -e): files, labels (space-separated, same order), out,
# title, subtitle (the second title line).
# Data columns: 1 concurrency, 2 output tok/s, 3 req/s (see plot.sh).
set terminal pngcairo size 1200,500 noenhanced font 'DejaVu Sans,11'
set output out
set multiplot layout 1,2 title title."\n".subtitle font ',12'
set logscale x 2
set xlabel 'concurrency (requests in flight)'
set grid xtics ytics lc rgb '#dddddd'
set key top left box opaque width 2
set yrange [0:*]
set style data linespoints
set title 'output throughput'
set ylabel 'output tokens / s'
plot for [i=1:words(files)] word(files, i) using 1:2 lw 2 pt 7 ps 1.1 title word(labels, i)
set title 'request throughput'
set ylabel 'completed requests / s'
plot for [i=1:words(files)] word(files, i) using 1:3 lw 2 pt 7 ps 1.1 title word(labels, i)
unset multiplot
