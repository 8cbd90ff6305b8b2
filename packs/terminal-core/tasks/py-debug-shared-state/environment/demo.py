from orders import add_item, new_order, summary

a = add_item(new_order("ana"), "pen", 2)
b = add_item(new_order("ben"), "ink")
print(a)
print(b)
print(summary([a, b]))
print(summary([b]))
