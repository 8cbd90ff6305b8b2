"""Thin adapters that let other trainers drive palaestra episodes (TRL, verl, SkyRL) and a
Gymnasium vector env over the batch routes. Each module imports its peer itself; this
package imports none of them."""
