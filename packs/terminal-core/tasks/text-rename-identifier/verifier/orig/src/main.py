import app.users as u
from app.report import line, lookup

print(line(1))
print(lookup("grace"))
print(u.get_usr(2), u._get_usr(3))
print("get_usrs is not a function;", "get_usr(x)")
