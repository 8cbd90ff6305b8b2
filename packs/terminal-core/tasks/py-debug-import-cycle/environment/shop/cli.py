"""Price a cart: python3 -m shop.cli CART.json

CART.json is a list of {"sku": ..., "qty": ...}. Prints one line per item,
`<sku> x<qty> = <line total>`, then `TOTAL <sum>`, amounts with two decimals.
"""
import json
import sys

from shop.models import Item


def main():
    with open(sys.argv[1]) as fh:
        items = [Item(e["sku"], e["qty"]) for e in json.load(fh)]
    total = 0.0
    for item in items:
        line = item.total()
        total += line
        print(f"{item.sku} x{item.qty} = {line:.2f}")
    print(f"TOTAL {total:.2f}")


if __name__ == "__main__":
    main()
