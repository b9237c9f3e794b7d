"""The pure billing core: rating, vouchers, invoices and the what-if over plain values.

No database, no web, no settings: its inputs are loaded by the shell (``app.billing.loader``)
and its results stored by it (``app.billing.service``); a contract keeps it that way.
"""
