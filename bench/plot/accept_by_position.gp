# Acceptance rate at each draft position, one line per proposer.
# Variables: files, labels, out, title, subtitle. Data columns: 1 position (1-based), 2 acceptance.
set terminal pngcairo size 900,520 noenhanced font 'DejaVu Sans,11'
set output out
set title title."\n".subtitle font ',12'
set xlabel 'draft position'
set ylabel 'acceptance rate (accepted / proposed)'
set yrange [0:1.05]
set xtics 1
set grid xtics ytics lc rgb '#dddddd'
set key top right box opaque width 2
set style data linespoints
plot for [i=1:words(files)] word(files, i) using 1:2 lw 2 pt 7 ps 1.2 title word(labels, i)
