from shop.models import Item

PRICES = {"apple": 0.5, "bread": 2.25, "cheese": 7.8, "dates": 4.0}
BULK = 10  # this many or more of one sku: 10 % off that line


def price_of(item):
    if not isinstance(item, Item):
        raise TypeError("price_of needs an Item")
    base = PRICES[item.sku]
    return base * 0.9 if item.qty >= BULK else base
