"""Goal templates of the BFCL-V3 functions: what a user would ask for, as data.

``GOALS[name]`` is a ``Goal``:

- ``kind``: ``"do"`` (the user wants a change), ``"answer"`` (the user wants the output),
  ``"read"`` (a look-around a user would not ask for: ``ls``, login-status checks) or
  ``"nav"`` (moving to where the goal happens: ``cd``). Whether a call *did* change the state
  is measured by replay (``coevolve.abstractors.template``); the kind decides only whether a
  call that changed nothing is still wanted (``answer``) and how goals are grouped.
- ``texts``: clauses with ``{parameter}`` placeholders, most specific first; the first whose
  placeholders are all among the call's arguments is used. Arguments no clause mentions are
  stated after it, so an instruction always holds every value its calls need.
- ``values``: per parameter, how a value reads in a sentence (``{"l": "lines"}``).

Functions without an entry fall back to the doc's own description (``fallback_goal``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Goal:
    kind: str
    texts: tuple[str, ...]
    values: dict[str, dict[Any, str]] = field(default_factory=dict)


def G(kind: str, *texts: str, **values: dict[Any, str]) -> Goal:
    return Goal(kind, texts, dict(values))


_CLASSES = {"first": "first-class", "business": "business-class"}  # "a first flight" reads wrong

GOALS: dict[str, Goal] = {
    # ------------------------------------------------------------ GorillaFileSystem
    "cat": G("answer", "show me what {file_name} contains"),
    "cd": G("nav", "go into {folder}", folder={"..": "the parent folder"}),
    "cp": G("do", "copy {source} to {destination}"),
    "diff": G("answer", "compare {file_name1} with {file_name2} line by line"),
    "du": G(
        "answer",
        "tell me how much disk space the current folder uses{human_readable}",
        "tell me how much disk space the current folder uses",
        human_readable={True: ", in human-readable units", False: ", in bytes"},
    ),
    "echo": G("do", "write {content} into {file_name}", "print {content}"),
    "find": G(
        "answer",
        "find every item named {name} under {path}",
        "find every item named {name}",
        "list everything under {path}",
        "list every file and folder below the current one",
    ),
    "grep": G("answer", "show me the lines of {file_name} that contain {pattern}"),
    "ls": G(
        "read", "list the current folder{a}", "list the current folder", a={True: ", hidden items included", False: ""}
    ),
    "mkdir": G("do", "create a folder named {dir_name}"),
    "mv": G("do", "move {source} to {destination}"),
    "pwd": G("read", "tell me which folder I am in"),
    "rm": G("do", "delete the file {file_name}"),
    "rmdir": G("do", "remove the folder {dir_name}"),
    "sort": G("answer", "show me the lines of {file_name} sorted"),
    "tail": G("answer", "show me the last {lines} lines of {file_name}", "show me the last lines of {file_name}"),
    "touch": G("do", "create an empty file named {file_name}"),
    "wc": G(
        "answer",
        "tell me how many {mode} {file_name} has",
        "tell me how many lines {file_name} has",
        mode={"l": "lines", "w": "words", "c": "characters"},
    ),
    # ------------------------------------------------------------ MathAPI
    "absolute_value": G("answer", "compute the absolute value of {number}"),
    "add": G("answer", "compute {a} plus {b}"),
    "divide": G("answer", "compute {a} divided by {b}"),
    "imperial_si_conversion": G("answer", "convert {value} {unit_in} to {unit_out}"),
    "logarithm": G("answer", "compute the base-{base} logarithm of {value} with {precision} digits of precision"),
    "max_value": G("answer", "find the largest of {numbers}"),
    "mean": G("answer", "compute the mean of {numbers}"),
    "min_value": G("answer", "find the smallest of {numbers}"),
    "multiply": G("answer", "compute {a} times {b}"),
    "percentage": G("answer", "compute what percentage {part} is of {whole}"),
    "power": G("answer", "compute {base} to the power of {exponent}"),
    "round_number": G(
        "answer", "round {number} to {decimal_places} decimal places", "round {number} to a whole number"
    ),
    "si_unit_conversion": G("answer", "convert {value} {unit_in} to {unit_out}"),
    "square_root": G("answer", "compute the square root of {number} with {precision} digits of precision"),
    "standard_deviation": G("answer", "compute the standard deviation of {numbers}"),
    "subtract": G("answer", "compute {a} minus {b}"),
    "sum_values": G("answer", "add up {numbers}"),
    # ------------------------------------------------------------ MessageAPI
    "add_contact": G("do", "add {user_name} to my contacts"),
    "delete_message": G(
        "do", "delete message {message_id} that I sent to {receiver_id}", "delete my latest message to {receiver_id}"
    ),
    "get_message_stats": G("answer", "show me my messaging statistics"),
    "get_user_id": G("answer", "look up the user id of {user}"),
    "list_users": G("answer", "list every messaging user"),
    "message_get_login_status": G("answer", "check whether I am logged in to messaging"),
    "message_login": G("do", "log in to messaging as user {user_id}"),
    "search_messages": G("answer", "find my messages that mention {keyword}"),
    "send_message": G("do", "send {message} to user {receiver_id}"),
    "view_messages_sent": G("answer", "show me the messages I have sent"),
    # ------------------------------------------------------------ TwitterAPI
    "authenticate_twitter": G("do", "log in to Twitter as {username} with password {password}"),
    "comment": G("do", "comment {comment_content} on tweet {tweet_id}"),
    "follow_user": G("do", "follow {username_to_follow}"),
    "get_tweet": G("answer", "show me tweet {tweet_id}"),
    "get_tweet_comments": G("answer", "show me the comments on tweet {tweet_id}"),
    "get_user_stats": G("answer", "show me the statistics of {username}"),
    "get_user_tweets": G("answer", "show me every tweet by {username}"),
    "list_all_following": G("answer", "list everyone I follow"),
    "mention": G("do", "mention {mentioned_usernames} in tweet {tweet_id}"),
    "post_tweet": G(
        "do",
        "post a tweet saying {content} with the tags {tags} and mentioning {mentions}",
        "post a tweet saying {content} with the tags {tags}",
        "post a tweet saying {content} mentioning {mentions}",
        "post a tweet saying {content}",
    ),
    "posting_get_login_status": G("answer", "check whether I am logged in to Twitter"),
    "retweet": G("do", "retweet tweet {tweet_id}"),
    "search_tweets": G("answer", "find tweets that mention {keyword}"),
    "unfollow_user": G("do", "unfollow {username_to_unfollow}"),
    # ------------------------------------------------------------ TicketAPI
    "close_ticket": G("do", "close ticket {ticket_id}"),
    "create_ticket": G(
        "do",
        "open a ticket titled {title} with priority {priority}, described as {description}",
        "open a ticket titled {title} with priority {priority}",
        "open a ticket titled {title}, described as {description}",
        "open a ticket titled {title}",
    ),
    "edit_ticket": G("do", "update ticket {ticket_id} with {updates}"),
    "get_ticket": G("answer", "show me ticket {ticket_id}"),
    "get_user_tickets": G("answer", "list my tickets with status {status}", "list my tickets"),
    "logout": G("do", "log out of the ticket system"),
    "resolve_ticket": G("do", "resolve ticket {ticket_id} with the resolution {resolution}"),
    "ticket_get_login_status": G("answer", "check whether I am logged in to the ticket system"),
    "ticket_login": G("do", "log in to the ticket system as {username} with password {password}"),
    # ------------------------------------------------------------ TradingBot
    "add_to_watchlist": G("do", "add {stock} to my watchlist"),
    "cancel_order": G("do", "cancel order {order_id}"),
    "filter_stocks_by_price": G("answer", "tell me which of {stocks} trade between {min_price} and {max_price}"),
    "fund_account": G("do", "add {amount} to my trading account"),
    "get_account_info": G("answer", "show me my account information"),
    "get_available_stocks": G("answer", "list the stocks of the {sector} sector"),
    "get_current_time": G("answer", "tell me the current time"),
    "get_order_details": G("answer", "show me the details of order {order_id}"),
    "get_order_history": G("answer", "show me my order history"),
    "get_stock_info": G("answer", "show me the current figures of {symbol}"),
    "get_symbol_by_name": G("answer", "look up the ticker symbol of {name}"),
    "get_transaction_history": G(
        "answer",
        "show me my transactions from {start_date} to {end_date}",
        "show me my transactions since {start_date}",
        "show me my transactions until {end_date}",
        "show me my transaction history",
    ),
    "get_watchlist": G("answer", "show me my watchlist"),
    "make_transaction": G("do", "make a {xact_type} of {amount} on account {account_id}"),
    "notify_price_change": G("answer", "tell me which of {stocks} moved by at least {threshold}%"),
    "place_order": G("do", "place a {order_type} order for {amount} shares of {symbol} at {price}"),
    "remove_stock_from_watchlist": G("do", "remove {symbol} from my watchlist"),
    "trading_get_login_status": G("answer", "check whether I am logged in to trading"),
    "trading_login": G("do", "log in to trading as {username} with password {password}"),
    "trading_logout": G("do", "log out of trading"),
    "update_market_status": G("answer", "tell me whether the market is open at {current_time_str}"),
    "update_stock_price": G("do", "set the price of {symbol} to {new_price}"),
    # ------------------------------------------------------------ TravelAPI
    "authenticate_travel": G(
        "do",
        "log in to the travel service as {user_first_name} {user_last_name} with client id {client_id}, "
        "client secret {client_secret}, refresh token {refresh_token} and grant type {grant_type}",
    ),
    "book_flight": G(
        "do",
        "book a {travel_class} flight from {travel_from} to {travel_to} on {travel_date} with card {card_id} "
        "using my access token {access_token}",
        travel_class=_CLASSES,
    ),
    "cancel_booking": G("do", "cancel booking {booking_id} using my access token {access_token}"),
    "compute_exchange_rate": G("answer", "convert {value} {base_currency} to {target_currency}"),
    "contact_customer_support": G("answer", "tell customer support about booking {booking_id}: {message}"),
    "get_all_credit_cards": G("answer", "list my credit cards"),
    "get_budget_fiscal_year": G("answer", "show me the fiscal-year budget"),
    "get_credit_card_balance": G(
        "answer", "tell me the balance of card {card_id} using my access token {access_token}"
    ),
    "get_flight_cost": G(
        "answer",
        "tell me what a {travel_class} flight from {travel_from} to {travel_to} on {travel_date} costs",
        travel_class=_CLASSES,
    ),
    "get_nearest_airport_by_city": G("answer", "find the airport nearest to {location}"),
    "list_all_airports": G("answer", "list every airport"),
    "purchase_insurance": G(
        "do",
        "buy {insurance_type} insurance for {insurance_cost} on booking {booking_id} with card {card_id} "
        "using my access token {access_token}",
    ),
    "register_credit_card": G(
        "do",
        "register card {card_number} of {cardholder_name}, expiring {expiration_date}, "
        "verification number {card_verification_number} using my access token {access_token}",
    ),
    "retrieve_invoice": G(
        "answer",
        "show me the invoice of booking {booking_id} using my access token {access_token}",
        "show me the invoice of insurance {insurance_id} using my access token {access_token}",
        "show me my invoice using my access token {access_token}",
    ),
    "set_budget_limit": G("do", "set my travel budget to {budget_limit} using my access token {access_token}"),
    "travel_get_login_status": G("answer", "check whether I am logged in to the travel service"),
    "verify_traveler_information": G(
        "answer", "verify the traveler {first_name} {last_name}, born {date_of_birth}, passport {passport_number}"
    ),
    # ------------------------------------------------------------ VehicleControlAPI
    "activateParkingBrake": G("do", "{mode} the parking brake", mode={"engage": "engage", "release": "release"}),
    "adjustClimateControl": G(
        "do",
        "set the climate control to {temperature} degrees {unit}",
        "set the climate control to {temperature} degrees",
        unit={"celsius": "Celsius", "fahrenheit": "Fahrenheit"},
    ),
    "check_tire_pressure": G("answer", "check the tire pressure"),
    "displayCarStatus": G("answer", "show me the car's {option} status"),
    "display_log": G("do", "show {messages} on the car's display", "put {messages} up on the dashboard screen"),
    "estimate_distance": G("answer", "estimate the distance between {cityA} and {cityB}"),
    "estimate_drive_feasibility_by_mileage": G("answer", "tell me whether the car can drive {distance} miles"),
    "fillFuelTank": G("do", "add {fuelAmount} gallons of fuel"),
    "find_nearest_tire_shop": G("answer", "find the nearest tire shop"),
    "gallon_to_liter": G("answer", "convert {gallon} gallons to liters"),
    "get_current_speed": G("answer", "tell me the current speed"),
    "get_outside_temperature_from_google": G("answer", "get the outside temperature from Google"),
    "get_outside_temperature_from_weather_com": G("answer", "get the outside temperature from weather.com"),
    "get_zipcode_based_on_city": G("answer", "look up the zip code of {city}"),
    "liter_to_gallon": G("answer", "convert {liter} liters to gallons"),
    "lockDoors": G(
        "do",
        "{unlock} the {door} doors",
        unlock={True: "unlock", False: "lock"},
        door={d: d.replace("_", " ") for d in ("driver", "passenger", "rear_left", "rear_right")},
    ),
    "pressBrakePedal": G("do", "press the brake pedal to position {pedalPosition}"),
    "releaseBrakePedal": G("do", "release the brake pedal"),
    "setCruiseControl": G(
        "do",
        "{activate} cruise control at {speed} mph, keeping {distanceToNextVehicle} meters to the next vehicle",
        activate={True: "turn on", False: "turn off"},
    ),
    "setHeadlights": G("do", "turn the headlights {mode}"),
    "set_navigation": G("do", "navigate to {destination}"),
    "startEngine": G("do", "{ignitionMode} the engine", ignitionMode={"START": "start", "STOP": "stop"}),
}


_PLACEHOLDER = re.compile(r"\{(\w+)\}")


def goal_for(name: str, doc: dict[str, Any] | None) -> Goal | None:
    """The environment's own goal of ``name`` (a doc's ``goal`` entry), else ``GOALS``'s, or None."""
    own = doc.get("goal") if doc else None
    if isinstance(own, dict) and own.get("texts"):
        return Goal(str(own.get("kind", "do")), tuple(own["texts"]), dict(own.get("values", {})))
    return GOALS.get(name)


def mentioned_params(name: str, doc: dict[str, Any] | None) -> set[str] | None:
    """The parameters some goal text of ``name`` can say, or None when it has no template
    (then nothing limits which parameters a call fills)."""
    goal = goal_for(name, doc)
    if goal is None:
        return None
    return {p for text in goal.texts for p in _PLACEHOLDER.findall(text)}


def fallback_goal(description: str) -> Goal:
    """A goal for a function without a template: its own description as a request."""
    text = description.strip().rstrip(".") or "call the function"
    return Goal("do", (text[:1].lower() + text[1:],))
