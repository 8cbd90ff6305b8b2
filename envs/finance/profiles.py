"""Company profiles and visual styles of the synthetic annual reports.

A profile fixes the business (its ratios and ranges, its segment and product names); a
style fixes the look (fonts, colours, ruled or unruled tables, page size, how many columns
the narrative has). Both are chosen by the document's structure seed; the numbers come
from its value seed (accounts.py), so a regenerated document keeps every row and page and
changes only the figures.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Profile:
    name: str
    industry: str
    nouns: tuple[str, ...]  # what the company sells, for the narrative
    segments: tuple[str, ...]
    gross_margin: tuple[float, float]
    sga: tuple[float, float]  # share of revenue
    rnd: tuple[float, float]
    capex: tuple[float, float]
    ppe: tuple[float, float]  # opening PP&E, share of revenue
    growth: tuple[float, float]
    ar_days: tuple[float, float]
    inv_days: tuple[float, float]
    ap_days: tuple[float, float]
    leverage: tuple[float, float]  # debt / EBITDA
    payout: tuple[float, float]
    headcount_per_m: tuple[float, float]  # employees per million of revenue (base units)
    operating_stat: str  # a narrative-only operating figure, e.g. "stores"


PROFILES: tuple[Profile, ...] = (
    Profile(
        name="industrial",
        industry="industrial machinery and automation",
        nouns=("drive systems", "factory automation", "precision components", "service contracts"),
        segments=(
            "Motion Systems",
            "Automation",
            "Precision Components",
            "Aftermarket Services",
            "Energy Solutions",
        ),
        gross_margin=(0.30, 0.40),
        sga=(0.11, 0.15),
        rnd=(0.03, 0.05),
        capex=(0.035, 0.06),
        ppe=(0.25, 0.40),
        growth=(-0.04, 0.12),
        ar_days=(55, 75),
        inv_days=(70, 110),
        ap_days=(40, 60),
        leverage=(1.0, 2.5),
        payout=(0.30, 0.50),
        headcount_per_m=(2.5, 4.0),
        operating_stat="manufacturing sites",
    ),
    Profile(
        name="software",
        industry="enterprise software and cloud services",
        nouns=("subscriptions", "cloud platforms", "analytics software", "professional services"),
        segments=(
            "Cloud Platform",
            "Applications",
            "Data and Analytics",
            "Professional Services",
            "Security",
        ),
        gross_margin=(0.68, 0.80),
        sga=(0.30, 0.38),
        rnd=(0.14, 0.20),
        capex=(0.02, 0.04),
        ppe=(0.08, 0.15),
        growth=(0.05, 0.25),
        ar_days=(60, 85),
        inv_days=(3, 8),
        ap_days=(25, 40),
        leverage=(0.3, 1.5),
        payout=(0.10, 0.30),
        headcount_per_m=(1.5, 2.8),
        operating_stat="enterprise customers",
    ),
    Profile(
        name="retail",
        industry="specialty retail",
        nouns=("apparel", "home furnishings", "online orders", "private-label products"),
        segments=("Stores", "Digital", "Wholesale", "International", "Outlet"),
        gross_margin=(0.34, 0.44),
        sga=(0.22, 0.28),
        rnd=(0.004, 0.01),
        capex=(0.03, 0.05),
        ppe=(0.20, 0.30),
        growth=(-0.03, 0.09),
        ar_days=(5, 15),
        inv_days=(80, 120),
        ap_days=(45, 70),
        leverage=(0.8, 2.0),
        payout=(0.25, 0.45),
        headcount_per_m=(6.0, 9.0),
        operating_stat="stores",
    ),
    Profile(
        name="pharma",
        industry="specialty pharmaceuticals",
        nouns=("oncology medicines", "vaccines", "generic medicines", "consumer health products"),
        segments=("Oncology", "Immunology", "Vaccines", "Consumer Health", "Generics"),
        gross_margin=(0.62, 0.75),
        sga=(0.24, 0.30),
        rnd=(0.12, 0.18),
        capex=(0.04, 0.06),
        ppe=(0.20, 0.30),
        growth=(0.00, 0.14),
        ar_days=(55, 80),
        inv_days=(120, 180),
        ap_days=(50, 75),
        leverage=(1.0, 2.2),
        payout=(0.35, 0.55),
        headcount_per_m=(1.8, 2.6),
        operating_stat="products in clinical development",
    ),
    Profile(
        name="consumer",
        industry="branded consumer goods",
        nouns=("beverages", "snacks", "personal care products", "household brands"),
        segments=("Beverages", "Snacks", "Personal Care", "Home Care", "Emerging Markets"),
        gross_margin=(0.40, 0.52),
        sga=(0.20, 0.26),
        rnd=(0.01, 0.02),
        capex=(0.04, 0.06),
        ppe=(0.25, 0.35),
        growth=(-0.02, 0.08),
        ar_days=(30, 45),
        inv_days=(45, 70),
        ap_days=(60, 90),
        leverage=(1.5, 3.0),
        payout=(0.45, 0.65),
        headcount_per_m=(2.0, 3.5),
        operating_stat="brands",
    ),
)


@dataclass(frozen=True)
class Style:
    name: str
    font: str
    bold: str
    accent: tuple[float, float, float]
    ruled: bool  # grid lines on financial tables
    page: str  # "letter" or "A4"
    two_column: bool  # narrative in two columns
    zero: str  # how a zero shows


STYLES: tuple[Style, ...] = (
    Style("classic", "Times-Roman", "Times-Bold", (0.10, 0.15, 0.35), True, "letter", True, "—"),
    Style("modern", "Helvetica", "Helvetica-Bold", (0.00, 0.40, 0.45), False, "A4", True, "–"),
    Style("ledger", "Helvetica", "Helvetica-Bold", (0.35, 0.10, 0.10), True, "A4", True, "-"),
    Style("minimal", "Times-Roman", "Times-Bold", (0.20, 0.20, 0.20), False, "letter", True, "—"),
)

CURRENCIES: tuple[tuple[str, str], ...] = (("USD", "$"), ("EUR", "€"), ("GBP", "£"))

NAME_FIRST = (
    "Aldern",
    "Brixton",
    "Calder",
    "Dunmore",
    "Eastgate",
    "Fairholm",
    "Greyfield",
    "Harrow",
    "Ironbridge",
    "Juniper",
    "Kestrel",
    "Larkspur",
    "Meridian",
    "Northwind",
    "Oakridge",
    "Pemberton",
    "Quayside",
    "Redcliff",
    "Silverline",
    "Thornbury",
)
NAME_SECOND = ("Holdings", "Group", "Industries", "Corporation", "plc", "Inc.", "AG", "S.A.")

COUNTRIES = (
    "United States",
    "Canada",
    "Mexico",
    "Brazil",
    "Argentina",
    "Chile",
    "Colombia",
    "Peru",
    "United Kingdom",
    "Ireland",
    "France",
    "Germany",
    "Netherlands",
    "Belgium",
    "Luxembourg",
    "Switzerland",
    "Austria",
    "Italy",
    "Spain",
    "Portugal",
    "Denmark",
    "Sweden",
    "Norway",
    "Finland",
    "Iceland",
    "Poland",
    "Czech Republic",
    "Slovakia",
    "Hungary",
    "Romania",
    "Bulgaria",
    "Greece",
    "Turkey",
    "Israel",
    "Saudi Arabia",
    "United Arab Emirates",
    "Qatar",
    "Egypt",
    "Morocco",
    "Nigeria",
    "Kenya",
    "South Africa",
    "India",
    "Pakistan",
    "Bangladesh",
    "Sri Lanka",
    "China",
    "Hong Kong",
    "Taiwan",
    "Japan",
    "South Korea",
    "Singapore",
    "Malaysia",
    "Thailand",
    "Vietnam",
    "Indonesia",
    "Philippines",
    "Australia",
    "New Zealand",
    "Estonia",
    "Latvia",
    "Lithuania",
    "Slovenia",
    "Croatia",
    "Serbia",
    "Ukraine",
    "Kazakhstan",
    "Ecuador",
    "Uruguay",
    "Costa Rica",
    "Panama",
    "Dominican Republic",
    "Jordan",
    "Oman",
    "Kuwait",
    "Bahrain",
    "Ghana",
    "Tanzania",
    "Cyprus",
    "Malta",
)
