from app.users import get_usr, get_usr_id


def line(uid):
    return f"{uid}: {get_usr(uid)} (get_usr)"


def lookup(name):
    return get_usr(get_usr_id(name))
