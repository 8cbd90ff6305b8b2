set -e
mkdir -p inbox/2023/q4 inbox/misc
for f in Report.TXT todo.txt photo.JPG diagram.png data.csv Makefile backup.tar.gz \
         deploy.Sh LICENSE 2023/budget.CSV 2023/summary.md 2023/q4/invoice.PDF \
         misc/notes.md misc/run.sh misc/CHANGELOG; do
  printf 'file %s\nline two of %s\n' "$(basename "$f")" "$f" > "inbox/$f"
done
