"""Count events per user.

Usage: python3 user_counts.py EVENTS_FILE
The file has one user id per line. Prints `<user> <count>` for every distinct user,
in the order in which users first appear in the file.
"""
import sys


def count_users(lines):
    users = []
    for line in lines:
        user = line.strip()
        if user and user not in users:
            users.append(user)
    ids = [line.strip() for line in lines]
    return [(user, ids.count(user)) for user in users]


def main():
    with open(sys.argv[1]) as fh:
        lines = fh.readlines()
    for user, n in count_users(lines):
        print(user, n)


if __name__ == "__main__":
    main()
