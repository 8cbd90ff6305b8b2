"""A tiny order book.

    new_order(customer, items=...) -> a new order; `items` is an optional list of
                                      (name, qty) pairs to start with
    add_item(order, name, qty=1)   -> adds a line to that order only, returns the order
    summary(orders)                -> {customer: total quantity over all their orders}
"""


def new_order(customer, items=[]):
    return {"customer": customer, "items": items}


def add_item(order, name, qty=1):
    order["items"].append((name, qty))
    return order


def summary(orders, totals={}):
    for order in orders:
        totals[order["customer"]] = totals.get(order["customer"], 0) + sum(
            qty for _name, qty in order["items"]
        )
    return totals
