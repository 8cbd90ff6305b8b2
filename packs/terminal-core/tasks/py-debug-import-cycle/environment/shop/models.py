from shop.pricing import price_of


class Item:
    def __init__(self, sku, qty):
        self.sku = sku
        self.qty = qty

    def total(self):
        return price_of(self) * self.qty
