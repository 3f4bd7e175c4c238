"""What the server tells its operators: events, the event log, structured logs,
loop and garbage-collector figures."""
