"""Calls a BFCL backend accepts but no user would ask for, judged on an episode's live state.

The backends check little: ``mv`` to a name that is not a folder renames the item, an order
may name any price, insurance may cost more than the trip, a user may follow themself, an
empty file may be read, a single number summed. A
synthesized task built on such a call states a request no annotator would accept ("move
documents to file3.txt", "buy Tesla at Google's price"). ``request_problem`` says why a call
is one of those, or None; exploration refuses such calls (``explorers.base.Session.execute``)
and the quality gate rejects tasks that make them (``coevolve.quality``). It reads the
instances' state (environment knowledge), never a benchmark question or answer.

    request_problem(instances, "mv", {"source": "report.txt", "destination": "notes.txt"})
    # "mv destination 'notes.txt' is no folder of the current folder: the call would rename ..."
"""

from __future__ import annotations

from typing import Any

# BFCL's own multi_turn_base asks for limit orders up to a third below the market (AAPL at
# 150 while it trades at 227) and insurance a little above the trip's cost; a price taken
# from another stock (Tesla at Google's 2840) or a budget as an insurance cost is beyond these
PRICE_TOLERANCE = 0.5  # an order or a new price within 50% of the stock's current price
INSURANCE_SHARE = 2.0  # insurance costing at most twice the trip
# a second login in one task asks for nothing the first did not (BfclEpisode.request_problem)
LOGINS = frozenset({"authenticate_travel", "authenticate_twitter", "ticket_login", "trading_login", "message_login"})
_USERNAME_PARAMS = ("username_to_follow", "username_to_unfollow", "username")


def request_problem(instances: dict[str, Any], name: str, args: dict[str, Any]) -> str | None:
    """Why a user would not ask for ``name(**args)`` in the state of ``instances`` (class
    name -> backend instance), or None."""
    rule = _RULES.get(name)
    return rule(instances, name, args) if rule is not None else None


def _names(directory: Any) -> set[str]:
    """Every name in the file tree of ``directory``, its own included (BFCL's Directory: ``name``,
    ``contents``)."""
    out: set[str] = {directory.name}
    for name, item in directory.contents.items():
        out.add(name)
        if hasattr(item, "contents"):
            out |= _names(item)
    return out


def _destination(instances: dict[str, Any], name: str, args: dict[str, Any]) -> str | None:
    """``mv``/``cp`` into a folder of the current folder, or to a new name (``report.txt`` ->
    ``report_2024.txt``, a rename or a copy under that name); not to a name the tree holds
    elsewhere (``mv documents file3.txt``, where file3.txt is a file inside documents: the call
    would rename, the request would mean something else), nor a folder to a file's name."""
    fs = instances.get("GorillaFileSystem")
    source, destination = args.get("source"), args.get("destination")
    if fs is None or not isinstance(destination, str) or not isinstance(source, str):
        return None
    if destination == source:
        return f"{name} of {source!r} onto itself"
    here = fs._current_dir.contents
    if hasattr(here.get(destination), "contents"):  # a folder of the current folder: into it
        return None
    if destination in here or source not in here:
        return None  # the backend refuses both; the call fails as it should
    if destination in _names(fs.root):
        return (
            f"{name} destination {destination!r} is no folder of the current folder but a name found "
            f"elsewhere: the call would rename {source!r} to it"
        )
    if hasattr(here[source], "contents") and "." in destination.strip("."):
        return f"{name} would give the folder {source!r} a file's name, {destination!r}"
    return None


def _empty_read(instances: dict[str, Any], name: str, args: dict[str, Any]) -> str | None:
    """Reading a file that holds nothing (one just created with ``touch``): the answer is empty."""
    fs = instances.get("GorillaFileSystem")
    if fs is None:
        return None
    for param in ("file_name", "file_name1", "file_name2"):
        item = fs._current_dir.contents.get(args.get(param)) if isinstance(args.get(param), str) else None
        if item is not None and not hasattr(item, "contents") and not str(getattr(item, "content", "x")).strip():
            return f"{name} reads {args[param]!r}, an empty file"
    return None


def _price(instances: dict[str, Any], name: str, args: dict[str, Any]) -> str | None:
    bot = instances.get("TradingBot")
    symbol = args.get("symbol")
    price = args.get("price", args.get("new_price"))
    if bot is None or not isinstance(price, (int, float)) or isinstance(price, bool):
        return None
    current = (bot.stocks.get(symbol) or {}).get("price") if isinstance(symbol, str) else None
    if isinstance(current, (int, float)) and current > 0 and abs(price / current - 1) > PRICE_TOLERANCE:
        return f"{name} price {price} is far from {symbol}'s price {current}"
    return None


def _insurance(instances: dict[str, Any], name: str, args: dict[str, Any]) -> str | None:
    travel = instances.get("TravelAPI")
    cost = args.get("insurance_cost")
    if travel is None or not isinstance(cost, (int, float)) or isinstance(cost, bool):
        return None
    record = travel.booking_record.get(args.get("booking_id")) if isinstance(args.get("booking_id"), str) else None
    trip = (record or {}).get("travel_cost")
    if isinstance(trip, (int, float)) and cost > INSURANCE_SHARE * trip:
        return f"{name} insurance_cost {cost} is far more than booking {args.get('booking_id')}'s trip ({trip})"
    return None


def _twitter_user(instances: dict[str, Any], name: str, args: dict[str, Any]) -> str | None:
    twitter = instances.get("TwitterAPI")
    for param in _USERNAME_PARAMS:
        user = args.get(param)
        if not isinstance(user, str):
            continue
        if user.startswith("@"):
            return f"{name} {param} {user!r} is a mention, not a username"
        if twitter is not None and param != "username" and user == twitter.username:
            return f"{name} {param} {user!r} is the user themself"
    return None


def _numbers(instances: dict[str, Any], name: str, args: dict[str, Any]) -> str | None:
    """A statistic of a single number, a number rounded that is already round, the absolute
    value of a positive number: a question whose answer is in it."""
    numbers = args.get("numbers")
    if isinstance(numbers, list) and len(numbers) < 2:
        return f"{name} of {len(numbers)} number(s)"
    number = args.get("number")
    if not isinstance(number, (int, float)) or isinstance(number, bool):
        return None
    places = args.get("decimal_places", 0)
    if name == "round_number" and isinstance(places, int) and round(number, places) == number:
        return f"{name} of {number}, already round to {places} places"
    if name == "absolute_value" and number >= 0:
        return f"{name} of {number}, which is not negative"
    return None


_RULES = {
    "mv": _destination,
    "cp": _destination,
    **{read: _empty_read for read in ("cat", "tail", "grep", "sort", "wc", "diff")},
    "place_order": _price,
    "update_stock_price": _price,
    "purchase_insurance": _insurance,
    "follow_user": _twitter_user,
    "unfollow_user": _twitter_user,
    "get_user_stats": _twitter_user,
    "get_user_tweets": _twitter_user,
    **{
        stat: _numbers
        for stat in (
            "mean",
            "standard_deviation",
            "min_value",
            "max_value",
            "sum_values",
            "round_number",
            "absolute_value",
        )
    },
}
