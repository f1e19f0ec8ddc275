"""How a turn reaches a client: websockets (``consumers``, ``routing``), server-sent events
(``sse``), and the chat page (``views``), sharing one way to open a conversation and run a turn
within the caller's limits (``turns``). Also the guards every transport applies: ``origins``
(the websocket Origin check), ``jsonbody`` (request bodies), ``sessions`` (an anonymous
visitor's conversations on sign-in).
"""
