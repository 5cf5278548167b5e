"""
What a running broker process does beside answering AMQP, in parts ``app.py`` wires together:
the background chores (``chores``), the backlog read for the gauges (``backlog``), what the
replica reports about itself (``reporting``) and the TLS listener (``listeners``).
"""
