"""Print the average score per subject from a CSV file (student,subject,score).

Usage: python3 report.py scores.csv
"""
import csv
import sys


def averages(path):
    totals = {}
    counts = {}
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            subject = row["subject"]
            totals.setdefault(subject, 0)
            counts.setdefault(subject, 0)
            if row["score"].strip():
                totals[subject] += float(row["score"])
                counts[subject] += 1
    return {s: totals[s] / counts[s] for s in totals}


def main():
    result = averages(sys.argv[1])
    for subject in sorted(result):
        print(f"{subject}: {result[subject]:.1f}")


if __name__ == "__main__":
    main()
