"""User lookups."""

USERS = {1: "ada", 2: "linus", 3: "grace"}


def get_usr_id(name):
    for uid, n in USERS.items():
        if n == name:
            return uid
    return None


def get_usr(uid):
    # get_usr returns the user's name, or "?" when unknown
    return USERS.get(uid, "?")


def _get_usr(uid):
    return "private:" + get_usr(uid)


def forget_usr(uid):
    USERS.pop(uid, None)
